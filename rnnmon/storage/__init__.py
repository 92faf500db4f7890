"""Log directories on object storage (`gs://`, `s3://`): a local staging folder uploaded in the background, and a
local mirror of a remote log directory read by rnnmon's own reader. See docs/storage.md."""
