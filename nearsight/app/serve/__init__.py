"""The server both faces (the page and REST) stand on: its settings (settings.py), what serving
checks first (run.py), the key guard and sign-in (guard.py, auth.py), allowed hosts, the
connection budgets (slow_clients.py: uvicorn's h11 protocol under a policy), the fair work
gates (gates.py), uploads, live reload, the embedding batcher and its metrics. It imports
neither face; nearsight/app/server_app.py assembles them."""
