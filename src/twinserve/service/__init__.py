"""The service, apart from its transports: the request's lifecycle, routes, replies, admission from a head, auth,
CORS, hosts and the handlers every front shares. Nothing here imports a web framework, a server or an adapter
(fronts/); the adapters turn their transport's events into calls on these objects."""
