"""Autoscaler actuators for inference fleets: an HPA-like policy driven by the latency SLO and
the request queue (:mod:`.policy`, pure), and the targets it scales: the scale subresource of
a Kubernetes Deployment or StatefulSet (:mod:`.kubernetes`) or any HTTP webhook
(:mod:`.webhook`); :func:`.reconcile.autoscale` joins them.

Stored autoscalers (table ``autoscalers``): definitions checked by :mod:`.spec` and kept by
:mod:`.store`, signals read from the store by :mod:`.signals`, targets built by
:mod:`.targets`, one pass per autoscaler in :mod:`.service`, run periodically by :mod:`.tasks`."""

# What the API and the task registry use; modules, not names: importing the package loads none.
__all__ = ["store", "tasks"]
