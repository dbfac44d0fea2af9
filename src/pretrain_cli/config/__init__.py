"""The only reader of the user's argument file: parsing, presets, resolution, the resolved `RunConfig`.

`arguments` (the PaddleNLP keys) and `parser` type the flat PaddleNLP-style file into three `*Arguments`;
`presets` names the shipped models; `pipeline` reads the pipeline keys; `resolve` applies every rule and
produces the frozen `pretrain_cli.run_config.RunConfig`. What opens what the file points at (model config,
tokenizer, token files, resume checkpoint) and plans it for a device is a layer up (`orchestration`). Every
layer below reads the `RunConfig`, never the arguments.
"""
