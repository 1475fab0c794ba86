"""The service: the Serve app (one builder binds the deployments), the HTTP front, the target
replica server, the OpenAI-compatible HTTP and gRPC APIs, API keys, metrics and the admin client.
Only the app, the front and the server touch Ray (through cluster/)."""
