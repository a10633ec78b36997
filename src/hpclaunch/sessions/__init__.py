"""hpclaunch dev: interactive sessions (shell, Jupyter, VS Code) inside a run's allocation."""
