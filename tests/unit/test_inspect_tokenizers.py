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


def test_the_agreement_line_names_the_tokenizer_by_its_fullest_sidecar(tmp_path, capsys):
    """Files of one tokenizer, the first with a sidecar from before the fingerprint (tokenizer.json's sha256 alone):
    the line that says they agree named the tokenizer by that sha256, though the other file's sidecar records its
    ids fingerprint and fingerprint; it names it by those."""
    whole, _ = gpt2_style(tmp_path)
    _made(tmp_path, "a", whole)
    _made(tmp_path, "b", whole)
    sidecar = json.loads((tmp_path / "d" / "a.json").read_text())
    for field in ("tokenizer_ids_fingerprint", "tokenizer_fingerprint"):
        del sidecar[field]
    (tmp_path / "d" / "a.json").write_text(json.dumps(sidecar))
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert f"tokenizer: the 2 files with a sidecar agree: vocab 300, eos 0, {_said(whole)}; dtype uint16\n" in out, out


def test_groups_are_the_judge_s_own(tmp_path, capsys):
    """A sidecar from before the ids fingerprint (fingerprint alone) of the tokenizer another file's sidecar names
    in full is one tokenizer with it: the judge (`tokenizer_problems`) said so and the groups, keyed by whichever id
    a sidecar had first, made two of it (--json: 2 tokenizers with no problem; 'made with 3' where there are 2)."""
    whole, _ = gpt2_style(tmp_path)
    _made(tmp_path, "a", whole)
    _made(tmp_path, "b", whole)
    sidecar = json.loads((tmp_path / "d" / "b.json").read_text())
    del sidecar["tokenizer_ids_fingerprint"]
    (tmp_path / "d" / "b.json").write_text(json.dumps(sidecar))
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["problems"] == [] and [[f.rsplit("/", 1)[-1] for f in g["files"]] for g in info["tokenizers"]] == \
        [["a", "b"]], info["tokenizers"]
    assert info["tokenizers"][0]["tokenizer_ids_fingerprint"] == load_tokenizer(whole).ids_fingerprint
    other = spaced(tmp_path, whole)
    _made(tmp_path, "c", other)
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().out.splitlines()[-1].startswith("tokenizers: the files were made with 2: ")


def test_groups_and_the_judge_agree_on_any_sidecars():
    """On random sidecars drawn from a few fingerprints, ids fingerprints and sha256s (some from before either
    field), in any order: the groups are the connected sets of the pairwise rule (one fingerprint; one ids
    fingerprint between two with fingerprints; one sha256 where either has no fingerprint) whatever the order, and
    the judge refuses exactly where there is more than one. An old sidecar (sha256 alone) joins one with its sha256
    and, through its fingerprint, a reformatted copy (another sha256), which the judge, comparing pairs, refused."""
    import random

    from pretrain_cli.data.token_file_tokenizers import tokenizer_groups, tokenizer_problems

    old, new, copy = {"tokenizer_sha256": "s1"}, {"tokenizer_fingerprint": "f1", "tokenizer_sha256": "s1"}, \
        {"tokenizer_fingerprint": "f1", "tokenizer_sha256": "s2"}
    assert tokenizer_problems([("o", old), ("n", new), ("c", copy)]) == []
    assert len(tokenizer_problems([("o", old), ("c", copy)])) == 1  # not joined without `new`
    rng = random.Random(0)
    for _ in range(400):
        metas = []
        for _ in range(rng.randint(1, 6)):
            m = {"tokenizer_sha256": rng.choice(["s1", "s2", "s3", None])}
            if rng.random() < 0.7:
                m["tokenizer_fingerprint"] = rng.choice(["f1", "f2", "f3"])
                m["tokenizer_ids_fingerprint"] = rng.choice(["X", "Y", None])
            metas.append({k: v for k, v in m.items() if v is not None})
        items = [(f"p{i}", m) for i, m in enumerate(metas)]
        groups = tokenizer_groups(items)
        assert _partition(groups) == _connected([(p, m) for p, m in items if m]), items
        assert bool(tokenizer_problems(items)) == (len(groups) > 1), items
        shuffled = rng.sample(items, len(items))
        assert _partition(tokenizer_groups(shuffled)) == _partition(groups), items


def _partition(groups) -> list:
    return sorted(sorted(p for p, _ in g) for g in groups)


def _connected(items) -> list:
    """The sidecars naming a tokenizer, joined pairwise by the rule and closed over shared members (quadratic)."""
    def same(a, b):
        fa, fb = a.get("tokenizer_fingerprint"), b.get("tokenizer_fingerprint")
        ia, ib = a.get("tokenizer_ids_fingerprint"), b.get("tokenizer_ids_fingerprint")
        sa, sb = a.get("tokenizer_sha256"), b.get("tokenizer_sha256")
        return bool((fa and fa == fb) or (fa and fb and ia and ia == ib) or ((not fa or not fb) and sa and sa == sb))

    named = [(p, m) for p, m in items if m.get("tokenizer_fingerprint") or m.get("tokenizer_sha256")]
    groups = []
    for p, m in named:
        joined = [g for g in groups if any(same(m, m2) for _, m2 in g)]
        groups = [g for g in groups if g not in joined] + [[(p, m)] + [x for g in joined for x in g]]
    return _partition(groups)
