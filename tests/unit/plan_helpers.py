"""`plan`'s entry points as the tests read them: `plan --json`'s object and `plan --fit`'s result."""
from pretrain_cli.orchestration.planned import fit_file, from_file


def plan(*args, **kwargs) -> dict:
    """What `plan --json` prints (`orchestration.planned.from_file(...).to_json()`)."""
    return from_file(*args, **kwargs).to_json()


def fit(*args, **kwargs) -> dict:
    """What `plan --fit --json` prints (`orchestration.planned.fit_file(...)`'s result)."""
    return fit_file(*args, **kwargs)[1]
