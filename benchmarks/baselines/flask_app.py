"""Plain Flask: parse, predict in the request thread, answer. Run: gunicorn -k gthread -w 2 --threads 4 ..."""

from __future__ import annotations

from flask import Flask, Response, request

from .model import load_predictor

app = Flask(__name__)
predict = load_predictor()


@app.post("/predict")
def serve() -> Response:
    return Response(predict(request.get_json()["instances"]), content_type="application/json")


@app.get("/health")
def health() -> str:
    return "ok"
