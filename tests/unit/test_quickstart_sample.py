"""The quickstart's last step, the sample a new user judges the run by: greedy decoding of the 400-step tiny-qwen2
printed 'The with statement.  If the' and then 24 short lines, 18 of them 'the' (a loop, read as a broken model);
drawn at temperature 0.8, top-p 0.9 it reads as the pydoc-like text the model learnt, and a fixed seed keeps it
the same on every run."""
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_quickstart_sample_is_drawn_with_a_fixed_seed():
    lines = [shlex.split(line) for line in (REPO / "scripts" / "quickstart.sh").read_text().splitlines()
             if line.startswith("$CLI generate ")]
    assert len(lines) == 1
    argv = lines[0]
    options = dict(zip(argv[2::2], argv[3::2]))
    assert options["--temperature"] == "0.8" and options["--top_p"] == "0.9" and options["--seed"] == "1", argv
