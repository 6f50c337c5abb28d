"""A package whose import starts a thread, as a library might: a template must not fork it."""

import threading
import time

threading.Thread(target=lambda: time.sleep(3600), name="started-at-import", daemon=True).start()
