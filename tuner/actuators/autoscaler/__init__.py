"""Autoscaler actuators for inference fleets: an HPA-like policy driven by the latency SLO and
the request queue (:mod:`.policy`, pure), and the targets it scales: the scale subresource of
a Kubernetes Deployment or StatefulSet (:mod:`.kubernetes`) or any HTTP webhook
(:mod:`.webhook`); :func:`.reconcile.autoscale` joins them."""
