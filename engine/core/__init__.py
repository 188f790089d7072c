"""Engine cores: the engine in its own process (one per replica), behind the async Engine API.

    async with CoreClient(EngineConfig()) as engine:      # one core process
        stream = engine.open_stream(); stream.push_text("Hello."); stream.end()
        async for chunk in stream: ...

    group = await EngineGroup(config, GroupConfig(replicas=2)).start()   # supervised replicas

The shape of vLLM v1's EngineCoreClient / EngineCore: ZeroMQ sockets, msgpack headers, raw PCM
frames (messages.py). Imports no transport package.
"""

from .client import CoreClient, CoreStartFailed, CoreState
from .group import EngineGroup, GroupConfig

__all__ = ["CoreClient", "CoreStartFailed", "CoreState", "EngineGroup", "GroupConfig"]
