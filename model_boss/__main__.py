import gc
import sys

gc.disable()  # while the command's modules load: model_boss.cli.dispatch turns it on again
from .cli import main  # noqa: E402

sys.exit(main())
