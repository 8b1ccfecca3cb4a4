"""The serve bench: open-loop load against embedding servers (see bench_serve.py)."""
