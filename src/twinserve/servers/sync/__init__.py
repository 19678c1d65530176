"""The sync architecture's HTTP server: a gunicorn worker class of twinserve's own (worker.py) on gunicorn's
documented worker API, reading HTTP/1.1 with httptools (http.py) and running the Flask front in request threads."""
