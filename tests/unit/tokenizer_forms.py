"""Tokenizers in two forms and edited copies, built in tmp dirs (no downloads), for the tests of what decides a
tokenizer's identity (test_tokenizer_lineage, test_inspect_tokenizers)."""
import json

TEXT = ["hello world this is a test of the tokenizer number %d" % i for i in range(200)]


def gpt2_style(tmp_path, extra: str | None = None):
    """(the tokenizer.json directory, the vocab.json + merges.txt directory) of one byte-level BPE, as GPT-2 ships
    both: its tokenizer.json flags <|endoftext|> normalized, the two files carry no such flag."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken("<|endoftext|>", normalized=True, special=True)])
    if extra:
        tok.add_special_tokens([AddedToken(extra, special=True)])
    name = f"json{'_' + extra.strip('<>') if extra else ''}"
    whole, files = tmp_path / name, tmp_path / f"{name}_vm"
    whole.mkdir()
    files.mkdir()
    tok.save(str(whole / "tokenizer.json"))
    tok.model.save(str(files))
    return whole, files


def edited(tmp_path, whole, name: str, edit):
    """A copy of `whole`'s tokenizer.json with one part changed by `edit` (the serialisation, edited in place):
    everything else, vocabulary and merges too, is the same."""
    spec = json.loads((whole / "tokenizer.json").read_text())
    edit(spec)
    (tmp_path / name).mkdir()
    (tmp_path / name / "tokenizer.json").write_text(json.dumps(spec))
    return tmp_path / name


def spaced(tmp_path, whole):
    """`whole` with ByteLevel's add_prefix_space on: the pre-tokenizer alone differs."""
    return edited(tmp_path, whole, "spaced", lambda spec: spec["pre_tokenizer"].update(add_prefix_space=True))
