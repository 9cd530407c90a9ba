"""Built-in plugins; ``engine.plugins.registry`` lists them all in one place."""
