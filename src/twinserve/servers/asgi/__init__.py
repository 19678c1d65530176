"""The async architectures' HTTP server (async, hybrid): uvicorn's `Config` and `Server` with the app factory and
the WebSocket drain (server.py), one listening socket per worker process (listeners.py), twinserve's own HTTP/1.1
protocol on httptools, run by uvicorn through `uvicorn.Config(http=...)` (protocol.py), one cycle per request
(cycle.py), and a connection's early refusals and holds (crowd.py). What the protocol needs of the server's process
comes with it: `Served` (servers/served.py)."""
