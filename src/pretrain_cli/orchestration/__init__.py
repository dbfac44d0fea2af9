"""What orchestrates a run between the commands and the layers below: `prepare` (the parsed arguments resolved
for this machine, with the model config, tokenizer, token files and the checkpoint to resume: the `RunSpec`
(`run_spec`) `check` and `train` share) and `planned` (the parsed arguments resolved for a target device and
re-resolved with key changes: `plan`, `plan --fit`, `train`'s out-of-memory line). `config/` below it only reads
the user's file and resolves it."""
