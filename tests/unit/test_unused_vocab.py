"""A new model whose vocabulary is mostly rows no token id reaches: a preset's (Qwen3's 151,936) with a small
tokenizer of one's own trained, saved and spanned by the head's softmax a quarter of Qwen3-0.6B for nothing, and
`check` said OK with no word of `--vocab_size`, which it names only for a tokenizer larger than the model."""
import json

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target


def _notes(tmp_path, **keys) -> list[str]:
    tok_dir = tmp_path / "tok"
    if not tok_dir.exists():
        make_tokenizer(tok_dir)  # 300 tokens
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": "qwen3-0.6b", "num_hidden_layers": 1,
                                "tokenizer_name_or_path": str(tok_dir), "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "do_train": True, "max_seq_length": 16,
                                "max_steps": 2, "split": "1,1,1", "device": "cpu", **keys}))
    return [n for n in prepare(str(args), [], Target()).run.notes if n.startswith("vocab_size:")]


def test_a_preset_vocabulary_mostly_out_of_the_tokenizers_reach_is_noted_with_the_fix(tmp_path):
    rows = (151936 - 300) * 1024  # tied: the embedding is the head
    total = 151936 * 1024 + 15_730_944 + 1024  # one Qwen3-0.6B layer (q/k/v/o, SwiGLU, 2 norms, q/k norms), final norm
    assert _notes(tmp_path) == [
        f"vocab_size: the model has 151,936 rows, its tokenizer 300 tokens: {rows / 1e6:.1f} M parameters "
        f"({rows / total:.0%} of the model) that no token id reaches, trained, saved and in the head's softmax; "
        f"--vocab_size 384 builds the model to the tokenizer's size rounded up to a multiple of 128"]


def test_the_size_named_is_the_tokenizers_rounded_up_to_128_per_tensor_parallel_slice():
    """An unpadded size (300) gives the head ragged matmul tiles, and one tensor_parallel_degree does not divide
    cannot be split: the note names 128 x tp's next multiple, and none when that is no smaller than the model."""
    from types import SimpleNamespace as NS

    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.orchestration.opened import unused_vocab

    cfg = ModelConfig(model_type="qwen3", vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)

    def note(tokens, tp):
        args = NS(model=NS(continue_training=False, vocab_size=None), training=NS(tensor_parallel_degree=tp))
        return [n.split("; ")[-1] for n in unused_vocab(args, cfg, NS(vocab_size=tokens))]

    assert note(300, 1) == ["--vocab_size 384 builds the model to the tokenizer's size rounded up to a multiple of 128"]
    assert note(300, 4) == ["--vocab_size 512 builds the model to the tokenizer's size rounded up to a multiple of "
                            "128 x tensor_parallel_degree 4 = 512"]
    assert note(1024, 2) == ["--vocab_size 1024 builds the model to the tokenizer's size rounded up to a multiple of "
                             "128 x tensor_parallel_degree 2 = 256"]
    assert note(1900, 32) == []  # 4096, the model's own size


def test_a_vocab_size_the_user_set_is_not_noted(tmp_path):
    assert _notes(tmp_path, vocab_size=300) == []
    assert _notes(tmp_path, vocab_size=1000) == []  # set by the user: a choice (padding, room for more tokens)
