"""``python -m voicewire.engine.core``: an engine core process (started by ``CoreClient``)."""

from .process import main

main()
