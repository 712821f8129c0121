

def test_whether_a_submission_compiles_is_read_from_its_files(tmp_path):
    """The ranks import the compiler before the start-up allowance for a submission that mentions compiling:
    decided by harness code from the files, never from the check's report, which team code could write."""
    from harness.submission.screen import mentions_compile

    (tmp_path / "submission.py").write_text("CONFIG = {}\ndef get_model(c):\n    return None\n")
    assert not mentions_compile(tmp_path)
    (tmp_path / "model.py").write_text("import torch\nfast = torch.compile\n")
    assert mentions_compile(tmp_path)
    (tmp_path / "model.py").write_text("COMPILE = True\n")
    assert mentions_compile(tmp_path)
    (tmp_path / "model.py").unlink()
    (tmp_path / "notes.txt").write_text("torch.compile")  # not Python: not imported
    assert not mentions_compile(tmp_path)
