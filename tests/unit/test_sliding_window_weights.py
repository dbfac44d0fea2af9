"""Pretrained weights trained with a sliding window (`use_sliding_window: true`) run where full attention, the only
attention here, is provably the same model: no layer has the window as transformers reads the config.json, or no
sequence reaches it (transformers' mask keeps a key while kv_idx > q_idx - window). Then one note, and the window's
keys stay in the config.json a model saved from them gets; past the window, one refusal naming what sets the length.
Which layers have the window, and where it starts masking, is read off transformers' own models."""
import json

import numpy as np
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.models import position_checks
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration import opened

QWEN2 = dict(model_type="qwen2", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
SWA = {**QWEN2, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
       "layer_types": ["full_attention"] + ["sliding_attention"] * 3}
WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def test_a_new_model_is_still_told_to_turn_the_window_off():
    with pytest.raises(UserError, match="use_sliding_window=true is not supported; set it to false"):
        ModelConfig.from_dict(SWA)


def test_within_the_window_pretrained_weights_run_and_keep_their_window_keys():
    """The old code refused at 16 tokens though it said the model was the same there. The length is judged once,
    by window_note (from_dict judged it too, its note thrown away)."""
    cfg = ModelConfig.from_dict(SWA, "hub/swa/config.json", pretrained=True)
    assert {k: cfg.to_hf_dict()[k] for k in WINDOW_KEYS} == {k: SWA[k] for k in WINDOW_KEYS}  # saved as read
    note = position_checks.window_note(cfg, "hub/swa/config.json", 16, "max_seq_length")
    assert note.startswith("hub/swa/config.json: use_sliding_window: true: layers 1-3 of 4 attend to the last 16 "
                           "tokens, and sequences of 16 tokens never reach that window")
    with pytest.raises(UserError) as e:
        position_checks.window_note(cfg, "hub/swa/config.json", 64, "max_seq_length")
    assert "sequences of 64 tokens reach past that window" in str(e.value)
    assert str(e.value).endswith("lower max_seq_length to at most 16") and "set it to false" not in str(e.value)
    none = {**SWA, "max_window_layers": 4, "layer_types": ["full_attention"] * 4}  # no layer has it: any length
    cfg = ModelConfig.from_dict(none, "n/config.json", pretrained=True)
    assert "no layer has a window" in position_checks.window_note(cfg, "n/config.json", 64, "max_seq_length")
    assert cfg.to_hf_dict()["layer_types"] == ["full_attention"] * 4
    odd = {**SWA, "layer_types": ["full_attention", "sliding_attention", "linear_attention", "sliding_attention"]}
    with pytest.raises(UserError, match=r"^s/config.json: layer_types .*: only full_attention and sliding_attention "
                                        r"layers are built here"):
        ModelConfig.from_dict(odd, "s/config.json", pretrained=True)  # (the old code kept it unchecked)


def test_check_says_so_in_its_notes_and_names_max_seq_length_past_it(tmp_path):
    """`build_model_config` (check, train, plan) passes continue_training and max_seq_length on."""
    d = tmp_path / "swa"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SWA))
    args = parse_config(None, ["--model_name_or_path", str(d), "--continue_training", "1", "--max_seq_length", "8"])
    opened.build_model_config(args)
    assert any("sequences of 8 tokens never reach that window" in n for n in args.rewritten), args.rewritten
    for flag, said in (("1", "lower --max_seq_length to at most 16$"), ("0", "set it to false")):
        args = parse_config(None, ["--model_name_or_path", str(d), "--continue_training", flag,
                                   "--max_seq_length", "32" if flag == "1" else "8"])
        with pytest.raises(UserError, match=said):  # (the command line set it)
            opened.build_model_config(args)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"model_name_or_path": str(d), "continue_training": 1, "max_seq_length": 32}))
    with pytest.raises(UserError, match=" lower max_seq_length to at most 16$"):  # the file's key
        opened.build_model_config(parse_config(str(run), []))


def _masked_layers(model_type: str, first: int, n: int = 4, window: int = 4) -> list[int]:
    """The layers of transformers' own model whose attention mask drops the key `window` positions back (and keeps
    the one `window - 1` back), as its forward passes the mask to each layer."""
    import torch
    import transformers

    cls = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "qwen2_moe": transformers.Qwen2MoeForCausalLM, "qwen3_moe": transformers.Qwen3MoeForCausalLM}[model_type]
    kw = dict(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=n, num_attention_heads=2,
              num_key_value_heads=1, use_sliding_window=True, sliding_window=window, max_window_layers=first)
    if "moe" in model_type:
        kw.update(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8)
    if model_type == "qwen2_moe":
        kw.update(shared_expert_intermediate_size=8)
    config = cls.config_class(**kw)
    config._attn_implementation = "eager"  # an additive mask to read
    model, masks = cls(config).eval(), {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda m, a, k, i=i: masks.__setitem__(i, k.get("attention_mask")),
                                        with_kwargs=True)
    with torch.no_grad():
        model(torch.arange(8)[None])
    assert all(masks[i] is not None and masks[i][0, 0, 7, 7 - window + 1] == 0 for i in range(n))
    return [i for i in range(n) if masks[i][0, 0, 7, 7 - window] < -1]


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe"])
def test_the_windowed_layers_are_those_transformers_masks(model_type):
    """The old test built Qwen3-MoE's expectation from the code's own assumption (every layer); here each family's
    model says which layers drop a key `window` back (Qwen3-MoE: one mask for all layers when the window is on)."""
    for first in (0, 1, 3):
        d = {"model_type": model_type, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 4,
             "max_window_layers": first}
        assert position_checks._window_layers(d) == (4, _masked_layers(model_type, first)), first


def test_transformers_qwen2_is_the_same_model_until_a_sequence_passes_the_window():
    """What the note claims, checked on transformers' own Qwen2: with the window on every layer, logits over
    16 tokens equal those of full attention; from 17 tokens on they differ."""
    import torch
    import transformers

    torch.manual_seed(0)
    kw = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
    full = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()
    swa = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw, use_sliding_window=True, sliding_window=16,
                                                                 max_window_layers=0)).eval()
    swa.load_state_dict(full.state_dict())
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 96, (1, 24)))
    with torch.no_grad():
        a, b = full(ids).logits, swa(ids).logits
    assert torch.allclose(a[:, :16], b[:, :16], atol=1e-6)
    assert not torch.allclose(a[:, 16:], b[:, 16:], atol=1e-3)


def _export(tmp_path, positions: int, layers: int = 1):
    """transformers' own Qwen2 with the window on every layer (16 tokens), saved with a tokenizer."""
    import torch
    import transformers

    from data_helpers import make_tokenizer

    torch.manual_seed(0)
    d = tmp_path / f"swa{positions}x{layers}"
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=320, hidden_size=16, intermediate_size=24, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=positions, use_sliding_window=True, sliding_window=16,
        max_window_layers=0)).save_pretrained(d)
    make_tokenizer(d)
    return str(d)


def test_eval_and_generate_judge_the_length_a_forward_reads(tmp_path, capsys, monkeypatch):
    """eval names --max_seq_length; generate judges, once, the longest sequence a forward reads: the prompt and its
    new tokens but the last (never read back), at most the context limit, where its context slides (a window that
    holds a whole context is never reached); at the boundary prompt + --max_new_tokens - 1 = the window it runs
    (refused before: the last token was counted). With --prompt_file it names the prompt."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.commands import eval as evaluate
    from pretrain_cli.data.tokenizer import load_tokenizer

    wide = _export(tmp_path, 64)
    with pytest.raises(UserError, match=r"sequences of 32 tokens reach past that window.*lower --max_seq_length to "
                                        r"at most 16$"):
        evaluate._model_config(wide, 32, "--max_seq_length")
    evaluate._model_config(wide, 16, "--max_seq_length")
    assert capsys.readouterr().err.splitlines()[-1] == (  # (above it: transformers' save bar)
        f"note: {wide}/config.json: use_sliding_window: true: layer 0 of 1 attend to the last 16 tokens, and "
        f"sequences of 16 tokens never reach that window (transformers masks only keys 16 or more positions back), "
        f"so full attention, which runs here, is the same model (config.json keeps the window)")
    prompt = len(load_tokenizer(wide).encode("hello"))
    code = cli_main(["generate", "--model", wide, "--prompt", "hello", "--max_new_tokens", str(18 - prompt)])
    err = capsys.readouterr().err
    assert code == 2 and "sequences of 17 tokens reach past that window" in err
    assert err.rstrip().endswith("lower the prompt's tokens + --max_new_tokens - 1 to at most 16"), err
    code = cli_main(["generate", "--model", wide, "--prompt", "hello", "--max_new_tokens", str(17 - prompt), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "sequences of 16 tokens never reach that window" in out.err and len(json.loads(out.out)["tokens"]) == \
        17 - prompt
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\nhello\n")
    code = cli_main(["generate", "--model", wide, "--prompt_file", str(prompts), "--max_new_tokens", "30"])
    assert code == 2 and f"lower the tokens of the prompt at {prompts}:2 + --max_new_tokens - 1 to at most 16" in \
        capsys.readouterr().err
    long = "hello there " * 10  # the prompt alone reads past the window: only a shorter one helps, with its count
    code, tokens = cli_main(["generate", "--model", wide, "--prompt", long, "--max_new_tokens", "1"]), \
        len(load_tokenizer(wide).encode(long))
    err = capsys.readouterr().err
    assert code == 2 and tokens > 16 and err.rstrip().endswith(
        f"lower the {tokens} tokens of the prompt (only a shorter prompt helps: a forward reads the whole prompt at "
        f"any --max_new_tokens) to at most 16"), err
    narrow = _export(tmp_path, 16, layers=2)  # the window (16) holds the whole context (16 positions)
    judged, window_note = [], position_checks.window_note
    monkeypatch.setattr(position_checks, "window_note", lambda cfg, source, length, key: judged.append(length) or
                        window_note(cfg, source, length, key))
    code = cli_main(["generate", "--model", narrow, "--prompt", "hello", "--max_new_tokens", "30", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert judged == [16]  # once, at the limit (it was judged twice past it)
    assert [n for n in out.err.splitlines() if "that window" in n] == [  # (one note)
        f"note: {narrow}/config.json: use_sliding_window: true: layers 0-1 of 2 attend to the last 16 tokens, and "
        f"sequences of 16 tokens never reach that window (transformers masks only keys 16 or more positions back), "
        f"so full attention, which runs here, is the same model (config.json keeps the window)"]
    assert "from there the model saw only the last 16 tokens" in out.err and len(json.loads(out.out)["tokens"]) == 30
    new = 17 - len(load_tokenizer(narrow).encode("hello"))  # the last context read is the whole limit: no slide
    code = cli_main(["generate", "--model", narrow, "--prompt", "hello", "--max_new_tokens", str(new), "--json",
                     "--seed", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "sequences of 16 tokens never reach that window" in out.err and "model saw only" not in out.err
    assert json.loads(out.out)["model_weights"] == "trained weights" and len(json.loads(out.out)["tokens"]) == new


def test_a_slid_context_is_another_model_from_two_layers_on():
    """Why generate refuses a window shorter than its context limit rather than sliding its context at the window:
    re-encoding the last 16 of 24 tokens gives transformers' windowed last logits with one layer, but not with two
    (each layer's window reaches back through the one below, so the second sees tokens 16 + 15 back)."""
    import torch
    import transformers

    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 96, (1, 24)))
    gaps = []
    for layers in (1, 2):
        torch.manual_seed(0)
        swa = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=True, sliding_window=16,
            max_window_layers=0)).eval()
        with torch.no_grad():
            whole, slid = swa(ids).logits[0, -1], swa(ids[:, -16:]).logits[0, -1]
        gaps.append(float((whole - slid).abs().max()))
    assert gaps[0] < 1e-5 < 1e-3 < gaps[1], gaps


def test_eval_config_names_the_option_that_set_the_length(tmp_path, capsys):
    """`eval --config run.json --max_seq_length 32` of a continue_training run on windowed weights was told to
    "lower max_seq_length", the file's key, not the option it gave."""
    from data_helpers import write_tokens

    from pretrain_cli.cli import main as cli_main

    wide = _export(tmp_path, 64)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"model_name_or_path": wide, "continue_training": 1, "max_seq_length": 16,
                                  "input_dir": write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=320),
                                  "output_dir": str(tmp_path / "out"), "split": "50,50,0", "max_steps": 1,
                                  "per_device_eval_batch_size": 1, "eval_iters": 1}))
    assert cli_main(["eval", "--config", str(config), "--model", wide, "--max_seq_length", "32"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("lower --max_seq_length to at most 16") and "lower max_seq_length" not in err, err
