"""Writers: comparison JSON, visq.json, DOT, HTML, tables. They format results, never recompute them."""
