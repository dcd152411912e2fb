"""The tricks, grouped by where they act: data, loop, model, runtime. The folder is the registry."""
