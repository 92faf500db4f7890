"""The on-disk format: the summary schema, packed tables, event files, the writer and the one reader."""
