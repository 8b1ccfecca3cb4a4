"""``python -m tests.serve.two_cpu_engines [serve options]``: the server with two engine processes on the CPU, as
``--devices 0,1`` starts one per GPU (for ``test_engine_processes.py`` on machines without two GPUs)."""
import sys

from clip_flash.serve import frontends
from clip_flash.serve.cli import main
from clip_flash.serve.engine_hosts import EngineProcesses

frontends.start_engines = lambda config, directory: EngineProcesses([config, config], directory)

if __name__ == "__main__":
    sys.exit(main())
