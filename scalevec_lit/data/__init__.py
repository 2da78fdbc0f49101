"""Data: preparing text into token shards (``prepare``), the tokenizer, and ``TokenDataModule``, the data
module a recipe's ``data:`` section configures (local folders and S3-compatible stores, streamed by litdata)."""
