"""Agent-framework adapters: voicewire as the TTS of a Pipecat pipeline or a LiveKit agent.

Each module imports its framework; install it with ``pip install voicewire[pipecat]`` or
``voicewire[livekit]``. Both speak protocol v1 through ``voicewire.realtime.client``.
"""
