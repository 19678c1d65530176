"""Running twinserve elsewhere: Ray Serve (`deploy.ray`), Kubernetes and KServe (`deploy.k8s`), a Dockerfile.

The submodules are imported on their own, so neither the Ray half nor the manifest half pulls in the other.
"""

__all__: list[str] = []
