"""Command-line front-ends of specstream-mlx (installed as `specstream_apps`)."""
