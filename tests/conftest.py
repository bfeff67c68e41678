import pytest


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """Runs a test inside tmp_path with W&B in offline mode, writing under tmp_path/wandb.

    wandb keeps its settings (the log directory among them) in a process-wide singleton made at the first
    `wandb.init`; tearing it down before and after the test makes each test read its own environment."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield tmp_path / "wandb"
    wandb.teardown()
