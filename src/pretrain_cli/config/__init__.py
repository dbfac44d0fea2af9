"""The only reader of the user's argument file: parsing, presets, resolution, the resolved `RunConfig`.

`parser` types the flat PaddleNLP-style file into three `*Arguments`; `resolve` applies every rule
and produces the frozen `pretrain_cli.run_config.RunConfig`; `prepare` opens what it points at (model config,
tokenizer, token files, resume checkpoint) for `check` and `train`. Every layer below reads the
`RunConfig`, never the arguments.
"""
