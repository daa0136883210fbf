"""The Prometheus remote-write receiver's logic: a ``WriteRequest`` body in, series checked as a
Prometheus receiver checks them and handed to a submit callback (:mod:`.receiver`). No web
framework here: the API route (``api/routes/remote_write.py``) authenticates, reads the body
and answers."""
