"""Built-in plugins; ``engine.framework.registry`` lists them all in one place."""
