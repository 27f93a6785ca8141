"""The application: repository, claims, runs (host binding), operator verbs, maintenance."""
