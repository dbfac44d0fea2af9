"""The sharded checkpoint's files on disk: safetensors shards streamed with their checksums (`shard_files`) and
the index that says where every piece of every tensor lives (`checkpoint_index`). Pure file formats, like
`data/indexed.py` for tokens: no Paddle, no ranks; the training and model layers above read and write through them."""
