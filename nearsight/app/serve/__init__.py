"""The server both faces (the page and REST) stand on: starting it (server.py) and the
``serve`` job (run.py), the key guard and sign-in (guard.py, auth.py), allowed hosts, the
connection budgets (slow_clients.py), live reload, the embedding batcher and its metrics."""
