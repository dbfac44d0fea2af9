"""inspect-data says which tokenizer made token files as their sidecars record it: the path preprocess was given,
the ids fingerprint (`Tokenizer.ids_fingerprint`, what decides whether two files or a file and a run's tokenizer
match) and the fingerprint train-tokenizer prints; for a directory, that its files were made with two forms of one
tokenizer (which agree), or with different tokenizers, naming each with its files. It showed the fingerprint alone
(two forms of one tokenizer looked like two tokenizers) and nothing of the tokenizer for one PREFIX."""
import json

from data_helpers import make_texts, run_preprocess, write_jsonl
from tokenizer_forms import gpt2_style, spaced

from pretrain_cli import cli
from pretrain_cli.data.tokenizer import load_tokenizer


def _made(tmp_path, name: str, tok) -> str:
    write_jsonl(tmp_path / f"{name}.jsonl", make_texts(20, seed=ord(name)))
    assert run_preprocess("--input_path", tmp_path / f"{name}.jsonl", "--output_prefix", tmp_path / "d" / name,
                          "--tokenizer", tok) == 0
    return str(tmp_path / "d" / name)


def _said(tok) -> str:
    t = load_tokenizer(tok)
    return f"tokenizer {tok} (ids fingerprint {t.ids_fingerprint[:12]}, fingerprint {t.fingerprint[:12]})"


def test_one_prefix_names_its_tokenizer_and_both_fingerprints(tmp_path, capsys):
    whole, _ = gpt2_style(tmp_path)
    prefix = _made(tmp_path, "a", whole)
    capsys.readouterr()
    assert cli.main(["inspect-data", prefix]) == 0
    assert f"made with {_said(whole)}\n" in capsys.readouterr().out
    assert cli.main(["inspect-data", prefix, "--json"]) == 0
    info, tok = json.loads(capsys.readouterr().out), load_tokenizer(whole)
    assert (info["tokenizer"], info["tokenizer_ids_fingerprint"], info["tokenizer_fingerprint"]) == \
        (str(whole), tok.ids_fingerprint, tok.fingerprint)
    # a sidecar from before the ids fingerprint: the fingerprint alone, said as such
    sidecar = json.loads((tmp_path / "d" / "a.json").read_text())
    del sidecar["tokenizer_ids_fingerprint"]
    (tmp_path / "d" / "a.json").write_text(json.dumps(sidecar))
    assert cli.main(["inspect-data", prefix]) == 0
    assert f"made with tokenizer {whole} (fingerprint {tok.fingerprint[:12]})\n" in capsys.readouterr().out


def test_a_directory_names_the_forms_of_one_tokenizer_and_different_tokenizers(tmp_path, capsys):
    whole, files = gpt2_style(tmp_path)
    _made(tmp_path, "a", whole)
    _made(tmp_path, "b", files)
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert _said(whole) in out and _said(files) in out, out  # one row each: two fingerprints, one ids fingerprint
    ids = load_tokenizer(whole).ids_fingerprint[:12]
    assert load_tokenizer(files).ids_fingerprint[:12] == ids and out.count(f"ids fingerprint {ids}") == 3, out
    assert (f"tokenizer: the 2 files with a sidecar agree: vocab 300, eos 0, {_said(whole)}; 2 fingerprints: forms "
            f"of one tokenizer, which give the same ids; dtype uint16\n") in out, out
    other = spaced(tmp_path, whole)
    _made(tmp_path, "c", other)
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == (f"tokenizers: the files were made with 2: {whole}, {files} (ids fingerprint "
                                    f"{ids}): a, b; {other} (ids fingerprint "
                                    f"{load_tokenizer(other).ids_fingerprint[:12]}): c"), out
    assert "c.json: tokenizer fingerprint" in err and "the files were made with different tokenizers" in err, err
    assert cli.main(["inspect-data", str(tmp_path / "d"), "--json"]) == 2
    groups = json.loads(capsys.readouterr().out)["tokenizers"]
    assert [(g["tokenizers"], [f.rsplit("/", 1)[-1] for f in g["files"]]) for g in groups] == \
        [([str(whole), str(files)], ["a", "b"]), ([str(other)], ["c"])]
