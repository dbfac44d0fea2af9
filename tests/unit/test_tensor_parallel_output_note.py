"""`tensor_parallel_output: false` (PaddleNLP's logits gathered before the loss) has no effect here, and its note
said why as 'with tensor parallelism the LM head is split over the vocabulary whenever the degree divides it', while
under a pipeline, sequence, context or expert parallelism the note beside it in the same output said the LM head
stays whole (W3 walk: `check --world_size 2 --tensor_parallel_degree 2 --sequence_parallel true
--tensor_parallel_output false`). The note now says when the layout splits the head, true beside either."""
import pytest
from run_helpers import resolve_run


def _notes(*argv, world=2):
    notes = resolve_run("--tensor_parallel_output", "false", "--max_seq_length", "64", *argv, world=world).notes
    return [n for n in notes if n.startswith("tensor_parallel_output:")], notes


@pytest.mark.parametrize("argv", [("--sequence_parallel", "true"), ("--pipeline_parallel_degree", "2",
                                                                      "--gradient_accumulation_steps", "2")])
def test_the_note_does_not_say_the_head_is_split_where_another_says_it_stays_whole(argv):
    own, notes = _notes("--tensor_parallel_degree", "2", *argv, world=2 * (2 if "--pipeline_parallel_degree" in argv
                                                                           else 1))
    assert any("LM head stay whole" in n for n in notes)
    assert len(own) == 1 and "whenever the degree divides it" not in own[0]
    assert ("tensor parallelism splits the LM head over the vocabulary only without pipeline, sequence, context or "
            "expert parallelism") in own[0] and "keeps it whole otherwise" in own[0]


def test_alone_the_note_is_true_of_the_split_it_runs():
    own, _ = _notes("--tensor_parallel_degree", "2")
    assert resolve_run("--tensor_parallel_degree", "2", world=2).parallel.vocab_parallel
    assert len(own) == 1 and "the same loss either way" in own[0]
