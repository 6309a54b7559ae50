import io

from graphkern._progress import Progress


def test_callback_sees_every_final_count():
    seen = []
    with Progress(10, lambda d, t: seen.append((d, t)), min_interval=0.0) as bar:
        for _ in range(5):
            bar.update(2)
    assert seen[-1] == (10, 10)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_plain_text_names_rate_and_eta(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    out = io.StringIO()
    with Progress(4, True, unit="pairs", desc="mgk", stream=out, min_interval=0.0) as bar:
        bar.update(4)
    text = out.getvalue()
    assert "4/4 pairs (100%)" in text and "pairs/s" in text and "ETA" in text


def test_quiet_by_default():
    out = io.StringIO()
    with Progress(3, False, stream=out) as bar:
        bar.update(3)
    assert out.getvalue() == "" and bar.done == 3
