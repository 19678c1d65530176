"""`twinserve k8s`: Kubernetes (or KServe) manifests and a Dockerfile for `twinserve serve` with the same flags.

Stdout gets the Deployment, Service, HorizontalPodAutoscaler (+ prometheus-adapter rules), PodMonitor and
PrometheusRule as multi-document YAML; or the KServe InferenceService alone with `--kserve`, the Grafana dashboard
with `--dashboard`, the alerting rules as a plain Prometheus rules file with `--alert-rules`. `--out DIR` writes
them all, plus the image's build context (`Dockerfile`, this twinserve's wheel, the model files the command
names): `docker build -t IMAGE DIR`. With `--model-repository DIR` the container serves the repository at
/models, copied into the image or mounted read-only from `--repository-volume CLAIM`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from twinserve import __version__
from twinserve.cli_args import add_config_flags, positive
from twinserve.config import Config, load_config
from twinserve.deploy.context import copy_context, discover
from twinserve.deploy.dashboard import dashboard
from twinserve.deploy.dockerfile import dockerfile
from twinserve.deploy.k8s import (
    ADMIN_KEY_ENTRY,
    REDIS_URL_ENTRY,
    inference_service,
    manifests,
    monitoring_scope,
    serve_command,
    to_yaml,
)
from twinserve.deploy.k8s_plan import DEFAULT_MEMORY_PER_PROCESS_MIB, K8sPlan, cpu_request_cores
from twinserve.deploy.monitoring import DEFAULT_AVAILABILITY, Objectives, latency_bucket_s, rules_file
from twinserve.deploy.needed_extras import check_extras, describe_extras, needed_extras, provided_extras
from twinserve.deploy.wheel import write_wheel
from twinserve.errors import ConfigError
from twinserve.lab.advise import AutoscalingTargets, autoscaling_targets
from twinserve.lab.results import Results, Run
from twinserve.lab.tune.results import load_measured
from twinserve.secret_settings import url_has_credential

__all__ = ["add_k8s", "k8s_config"]


def _autoscale(text: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX replicas, got {text!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return low, high


def add_k8s(k8s: argparse.ArgumentParser) -> None:
    """The arguments of `twinserve k8s`: its own, and every serve setting's flag."""
    k8s.description = __doc__
    k8s.formatter_class = argparse.RawDescriptionHelpFormatter
    k8s.add_argument("models", nargs="*", metavar="MODEL", help="as for `twinserve serve`")
    k8s.add_argument("--image", required=True, help="container image that has twinserve (see the Dockerfile)")
    scale = k8s.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=positive(int), help="a fixed number of pods (no autoscaler)")
    scale.add_argument(
        "--autoscale", type=_autoscale, default=(2, 10), metavar="MIN,MAX", help="autoscaler bounds (default 2,10)"
    )
    k8s.add_argument(
        "--results",
        type=Path,
        help="bench's or tune's results.json (or its folder): autoscaling targets, memory, and the measured settings "
        "for flags left unset",
    )
    k8s.add_argument(
        "--slo-p95-ms",
        type=positive(float),
        help="P95 objective: the latency SLO the alerts hold to, and for --results the level to size on "
        "(default: the objective bench or tune measured against; none: no latency alerts)",
    )
    k8s.add_argument(
        "--slo-availability",
        type=_percentage,
        default=DEFAULT_AVAILABILITY,
        metavar="PERCENT",
        help=f"share of inference requests to answer without a 5xx, for the burn-rate alerts (default "
        f"{DEFAULT_AVAILABILITY:g})",
    )
    k8s.add_argument("--name", default="twinserve", help="object names (default twinserve)")
    k8s.add_argument("--namespace", help="namespace of every object (default: kubectl's)")
    k8s.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write kubernetes.yaml, kserve.yaml and the image's build context here: Dockerfile, a twinserve wheel "
        "and the model files (docker build -t IMAGE DIR)",
    )
    stdout = k8s.add_mutually_exclusive_group()
    stdout.add_argument("--kserve", action="store_true", help="stdout: the KServe InferenceService instead")
    stdout.add_argument("--dashboard", action="store_true", help="stdout: the Grafana dashboard (JSON) instead")
    stdout.add_argument(
        "--alert-rules", action="store_true", help="stdout: the alerting rules as a Prometheus rules file instead"
    )
    k8s.add_argument(
        "--memory-per-process-mib",
        type=positive(float),
        default=DEFAULT_MEMORY_PER_PROCESS_MIB,
        help=f"memory per process without --results (default {DEFAULT_MEMORY_PER_PROCESS_MIB:g})",
    )
    k8s.add_argument("--startup-timeout", type=positive(float), default=600.0, metavar="SECONDS")
    k8s.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME",
        help="with --out: an extra the image installs twinserve with, beside those found in the models' imports, "
        "files and settings (repeatable; e.g. one a model imports by a name built at run time)",
    )
    k8s.add_argument(
        "--api-key-secret",
        type=_secret_ref,
        metavar="NAME[:KEY]",
        help="require API keys, read from this Secret's KEY (default api-keys; comma-separated keys) as "
        "TWINSERVE_API_KEYS: keys never go into the manifests",
    )
    k8s.add_argument(
        "--repository-volume",
        type=_claim_name,
        metavar="CLAIM",
        help="with --model-repository: an existing PersistentVolumeClaim holding the repository, mounted read-only "
        "at /models (default: the image holds it there; --out copies it into the build context)",
    )
    add_config_flags(k8s)
    k8s.set_defaults(handler=_k8s)


def _percentage(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"expected a percentage between 0 and 100 (e.g. 99.9), got {text!r}")
    return value


def _claim_name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"expected the name of a PersistentVolumeClaim, got {text!r}")
    return text


def _repository_checks(
    config: Config, repository_volume: str | None, replicas: int | None, api_key_secret: tuple[str, str] | None
) -> None:
    """--repository-volume needs a repository; the admin key never goes into a manifest; explicit model control
    reaches one pod per request: say so."""
    if config.admin_api_key is not None:
        raise ConfigError(
            "--admin-api-key: keys never go into a manifest; put it in the --api-key-secret Secret as "
            f"{ADMIN_KEY_ENTRY!r} (the container reads it from there)"
        )
    if url_has_credential(config.redis_url) and api_key_secret is None:
        raise ConfigError(
            "--redis-url holds a credential, which never goes into a manifest: pass --api-key-secret NAME:KEY and "
            f"put the URL in that Secret as {REDIS_URL_ENTRY!r} (the container reads it from there)"
        )
    if repository_volume is not None and config.model_repository is None:
        raise ConfigError("--repository-volume: needs --model-repository (the repository it holds)")
    if config.model_control == "explicit" and replicas != 1:
        print(
            "twinserve: warning: --model-control explicit: a load or unload reaches the one pod the Service sends "
            "it to; with several pods prefer --model-control poll over a --repository-volume, or a new image",
            file=sys.stderr,
        )


def _secret_ref(text: str) -> tuple[str, str]:
    name, _, key = text.partition(":")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name) or not re.fullmatch(r"[-._a-zA-Z0-9]*", key):
        raise argparse.ArgumentTypeError(f"expected NAME[:KEY] naming a Kubernetes Secret, got {text!r}")
    return name, key or "api-keys"


def k8s_config(overrides: dict[str, Any]) -> Config:
    """The server's Config in a pod: validated as `serve` would, bound to 0.0.0.0, workers pinned (default 1).

    Pinned because the defaults count the cores of the machine running the command (for sync), and inside a
    container those would be the node's, not the pod's share.
    """
    settings = {k: v for k, v in overrides.items() if v is not None and v != []}
    settings.update(host="0.0.0.0")
    config = load_config(**settings)
    if config.workers is None:  # neither a flag nor the --config file set it
        config = load_config(**settings, workers=1)
    if config.port < 1024:
        raise ConfigError(
            f"--port: the container runs as a non-root user and needs a fixed port >= 1024, not {config.port}"
        )
    if config.grpc_port is not None and config.grpc_port < 1024:
        raise ConfigError(
            f"--grpc-port: the container runs as a non-root user and needs a fixed port >= 1024, not {config.grpc_port}"
        )
    return config


def _bench_settings(results: Results, run: Run) -> dict[str, Any]:
    """The settings the benchmarked server ran with: its swept ones, and the defaults bench left to the machine."""
    settings = {k: v for k, v in run.settings.items() if k in Config.model_fields and v is not None}
    if run.arch == "sync":
        settings.setdefault("workers", results.machine.cpu_count)  # serve's default on the bench machine
    return settings


def _objectives(args: argparse.Namespace, p95: float | None) -> Objectives:
    """The SLO the alerts hold to: --slo-availability, and the P95 objective (--slo-p95-ms, else bench's)."""
    if p95 is not None:
        try:
            bound = latency_bucket_s(p95) * 1000
        except ValueError as exc:
            raise ConfigError(f"--slo-p95-ms: {exc}") from None
        if abs(bound - p95) > 1e-9:
            print(
                f"twinserve: note: the latency alerts count requests over {bound:g} ms, the largest latency bucket "
                f"not above the {p95:g} ms objective (a histogram counts at its bounds only)",
                file=sys.stderr,
            )
    return Objectives(availability=args.slo_availability, p95_ms=p95)


def _targets(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[Config, AutoscalingTargets, float]:
    """Targets from --results, with the measured model and run's settings for every flag the user left unset.

    Targets measured with one set of settings do not transfer to another, so an explicit flag that differs from
    the measured run gets a warning. Also returns the P95 objective used (--slo-p95-ms, else bench's). From tune's
    results the basis is tune's capacity (`lab.tune.results.tune_capacity`), which the targets' description names.
    """
    try:
        measured = load_measured(args.results, args.slo_p95_ms)  # bench's results, or tune's winner as one run
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--results: {exc}") from None
    results = measured.results
    slo = args.slo_p95_ms or results.slo_p95_ms
    if slo is None:
        raise ConfigError("--slo-p95-ms: needed with --results (the bench had no objective)")
    if not overrides.get("models") and overrides.get("model_repository") is None:
        # The model that was measured: tune's of a repository, or a bench over a repository, serve the repository
        # (whose [settings] hold the model's knobs); else the MODEL that was measured.
        if measured.model_repository is not None:
            overrides["model_repository"] = measured.model_repository
        elif results.repository is not None:
            overrides["model_repository"] = Path(results.repository)
        else:
            overrides["models"] = [results.model]
    if measured.tuned_arch is not None and overrides.get("arch") is None and overrides.get("config_file") is None:
        overrides["arch"] = measured.tuned_arch  # tune's winner (its winner.toml, if given, says the same)
    given = k8s_config(overrides)
    arch = given.arch
    try:
        basis = autoscaling_targets(results, arch, slo).basis
    except ValueError as exc:
        # tune's results: why its capacity is missing says more than "no level met the SLO".
        why = f" ({measured.basis})" if measured.basis is not None and arch == measured.tuned_arch else ""
        raise ConfigError(f"--results: {exc}{why}") from None
    for name, value in _bench_settings(results, basis.run).items():
        if overrides.get(name) is None:
            overrides[name] = value
        elif getattr(given, name) != value:
            flag = "--" + name.replace("_", "-")
            print(
                f"twinserve: warning: {flag} {overrides[name]} differs from the measured {basis.run.label!r} "
                f"({value}); its autoscaling targets may not hold",
                file=sys.stderr,
            )
    config = k8s_config(overrides)
    targets = autoscaling_targets(results, arch, slo, cpu_request_cores(config))
    if measured.basis is not None:  # tune's capacity: the level's basis goes into the manifests' header
        targets = dataclasses.replace(targets, source=measured.basis)
    return config, targets, slo


def _plan(args: argparse.Namespace) -> K8sPlan:
    overrides = {name: getattr(args, name) for name in Config.model_fields}
    overrides["config_file"] = args.config_file  # load_config's keyword: the settings file `twinserve tune` writes
    targets: AutoscalingTargets | None = None
    slo: float | None = args.slo_p95_ms
    if args.results is None:
        config = k8s_config(overrides)
    else:
        config, targets, slo = _targets(args, overrides)
    _repository_checks(config, args.repository_volume, args.replicas, args.api_key_secret)
    return K8sPlan(
        config=config,
        image=args.image,
        name=args.name,
        namespace=args.namespace,
        replicas=args.replicas,
        autoscale=args.autoscale,
        memory_per_process_mib=args.memory_per_process_mib,
        targets=targets,
        startup_timeout_s=args.startup_timeout,
        api_key_secret=args.api_key_secret,
        objectives=_objectives(args, slo),
        repository_volume=args.repository_volume,
    )


def _k8s(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except ConfigError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    header = f"Generated by twinserve {__version__} k8s for: {shlex.join(serve_command(plan.config))}"
    if plan.targets is not None:
        header += f"\nAutoscaling target: {plan.targets.describe()}"
    if args.out is None:
        if args.dashboard:
            sys.stdout.write(_dashboard_json(plan))
        elif args.alert_rules:
            sys.stdout.write(to_yaml([rules_file(monitoring_scope(plan))], header))
        else:
            sys.stdout.write(to_yaml([inference_service(plan)] if args.kserve else manifests(plan), header))
        return 0
    try:
        # What the image needs is found before anything is written; only the wheel knows its extras' names.
        context = discover(plan.config, Path.cwd(), args.out, repository_in_image=plan.repository_volume is None)
        extras = needed_extras(context.scanned, plan.config, args.extra)
        args.out.mkdir(parents=True, exist_ok=True)
        wheel = write_wheel(args.out)
        check_extras(extras, provided_extras(wheel))
    except ConfigError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {wheel}")
    copy_context(context, args.out)
    for line in [*context.describe(), *describe_extras(extras)]:
        print(line)
    files = {
        "kubernetes.yaml": to_yaml(manifests(plan), header),
        "kserve.yaml": to_yaml([inference_service(plan)], header),
        "grafana-dashboard.json": _dashboard_json(plan),
        "prometheus-rules.yaml": to_yaml([rules_file(monitoring_scope(plan))], header),
        "Dockerfile": dockerfile(plan.config, wheel.name, extras, context),
    }
    for file_name, text in files.items():
        (args.out / file_name).write_text(text)
        print(f"wrote {args.out / file_name}")
    return 0


def _dashboard_json(plan: K8sPlan) -> str:
    return json.dumps(dashboard(monitoring_scope(plan)), indent=2) + "\n"
