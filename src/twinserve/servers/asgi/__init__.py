"""The async architectures' HTTP server (async, hybrid): twinserve's own HTTP/1.1 protocol on httptools, run by
uvicorn through `uvicorn.Config(http=HttpProtocol)` (protocol.py), one cycle per request (cycle.py), a connection's
early refusals and holds (crowd.py), and the Config its worker processes rebuild (settings.py)."""
