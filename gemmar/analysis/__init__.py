"""Traces, read anywhere with no cluster: the Trace table and its files (trace), figures (plots), Perfetto
JSON (perfetto), step-by-step replay (replay) and the host mirror of the tile schedule (schedule)."""
