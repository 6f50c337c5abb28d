"""Says it ran, and who its parent is."""

import os

if __name__ == "__main__":
    print(f"ran ppid={os.getppid()}", flush=True)
