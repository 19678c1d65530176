"""Plain Flask: parse, predict in the request thread, answer. Run: gunicorn -k gthread -w 2 --threads 4 ..."""

from __future__ import annotations

from benchmarks.baselines.model import load_predictor
from flask import Flask, Response, request

app = Flask(__name__)
predict = load_predictor()


@app.post("/predict")
def serve() -> Response:
    return Response(predict(request.get_json()["instances"]), content_type="application/json")


@app.get("/health")
def health() -> str:
    return "ok"
