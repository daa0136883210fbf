"""The OTLP/HTTP receiver's logic: wire decoding (:mod:`.decode`), metrics -> series
(:mod:`.metrics`), step-timing spans -> series (:mod:`.traces`), and the receiver that ties
them to a submit callback (:mod:`.receiver`), and where an export's data goes, remembered
through a database outage (:mod:`.targets`). No web framework here: the API route
(``api/routes/otlp.py``) reads the body, authenticates and answers."""
