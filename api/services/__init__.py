"""What routes need beyond one domain call, in HTTP terms: request bodies turned into the
domain's objects (studies), and store reads shaped into responses (series, exposition, health).
Domain logic lives below the API (``tuneloop.accounts``, ``tuneloop.jobs``, ...)."""
