"""agentsim plot: the figure for each kind of file is drawn (a real PNG), and a file that is not
a trajectory or study gets a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentsim.cli.main import main
from agentsim.plot import plot_file

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model, args", [
    ("sir", ["--agents", "2000", "--steps", "20"]),
    ("wolfsheep", ["--agents", "200", "--steps", "20", "--every", "5"]),
    ("boids", ["--agents", "300", "--steps", "5"]),
    ("schelling", ["--agents", "400", "--steps", "5"]),
    ("randomwalk", ["--agents", "300", "--steps", "5"]),
])
def test_every_model_file_gets_its_figure(model, args, tmp_path, capsys):
    out = tmp_path / f"{model}.h5"
    assert main(["run", model, "--quiet", "--out", str(out), *args]) == 0
    assert main(["plot", str(out)]) == 0
    png = (tmp_path / f"{model}.png").read_bytes()
    assert png[:8] == PNG and len(png) > 15_000
    assert f"wrote {tmp_path / model}.png" in capsys.readouterr().out


def test_a_study_file_gets_its_bands_and_other_files_an_error(tmp_path, capsys):
    from agentsim.study import Study

    Study("sir", {"beta": [0.03, 0.06]}, seeds=[1, 2], agents=300, steps=10).run(tmp_path / "s.h5", workers=1)
    written = plot_file(tmp_path / "s.h5", tmp_path / "bands.png")
    assert (tmp_path / "bands.png").read_bytes()[:8] == PNG and written == str(tmp_path / "bands.png")
    (tmp_path / "x.h5").write_text("not hdf5")
    assert main(["plot", str(tmp_path / "x.h5")]) == 1
    assert "cannot plot" in capsys.readouterr().err


@pytest.mark.parametrize("model, extra", [("boids", ["--agents", "200"]), ("schelling", ["--agents", "300"]),
                                          ("wolfsheep", ["--agents", "150"])])
def test_animate_writes_a_gif_of_every_recorded_frame(model, extra, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / f"{model}.h5"
    assert main(["run", model, "--quiet", "--steps", "6", "--every", "2", "--out", str(out), *extra]) == 0
    assert main(["animate", str(out), "--out", str(tmp_path / "a.gif")]) == 0
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 4  # steps 0, 2, 4, 6
    assert main(["animate", str(out), "--out", str(tmp_path / "a.avi")]) == 1
    assert "expected an output ending in .gif or .mp4" in capsys.readouterr().err


def _study_file(path, n_metrics=8, combos=2, replicates=3, steps=5):
    """A study file written through StudyFile: metrics m0..m{n-1}, n_cell and a vector metric."""
    import numpy as np

    from agentsim.study.store import StudyFile

    params = [{"beta": 0.1 * (c + 1)} for c in range(combos)]
    spec = {"model": "toy", "agents": 10, "steps": steps, "grid": {"beta": [p["beta"] for p in params]}}
    store = StudyFile(path, spec, combos * replicates)
    rng = np.random.default_rng(0)
    for c, p in enumerate(params):
        for r in range(replicates):
            metrics = {"step": np.arange(steps + 1), "n_cell": np.full(steps + 1, 10)}
            metrics.update({f"m{i}": rng.normal(size=steps + 1).cumsum() for i in range(n_metrics)})
            metrics["hist"] = rng.integers(0, 5, size=(steps + 1, 4))
            store.write_run(f"c{c:04d}-r{r:04d}", p, seed=r, combo=c, replicate=r, metrics=metrics, attempts=1,
                            seconds=0.0)
    store.finish(params)
    store.close()
    return path


@pytest.mark.long
def test_a_study_figure_shows_every_scalar_metric_on_pages(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentsim import plot
    from agentsim.plot import plot_pages

    path = _study_file(tmp_path / "s.h5")
    figs = plot._study_figures(str(path), plt, None)
    titles = [ax.get_title() for fig in figs for ax in fig.axes if ax.get_title()]
    for fig in figs:
        plt.close(fig)
    assert titles == [f"m{i}" for i in range(8)] + ["n_cell"]  # n_<population> too; no vector metric
    written = plot_pages(path, tmp_path / "bands.png")
    assert written == [str(tmp_path / "bands-1.png"), str(tmp_path / "bands-2.png")]  # 6 per page
    assert all(open(p, "rb").read(8) == PNG for p in written) and not (tmp_path / "bands.png").exists()
    assert plot_file(path, tmp_path / "bands.png") == written[0]
    assert main(["plot", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 's-1.png'}", f"wrote {tmp_path / 's-2.png'}"]


def test_plot_metrics_selects_and_unknown_names_are_config_errors(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentsim import ConfigError, plot

    path = _study_file(tmp_path / "s.h5")
    figs = plot._study_figures(str(path), plt, ["m3", "n_cell"])
    assert [ax.get_title() for ax in figs[0].axes if ax.get_title()] == ["m3", "n_cell"] and len(figs) == 1
    plt.close(figs[0])
    assert plot_file(path, tmp_path / "two.png", metrics=["m3", "n_cell"]) == str(tmp_path / "two.png")
    assert main(["plot", str(path), "--out", str(tmp_path / "cli.png"), "--metrics", "m1, m2"]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'cli.png'}\n"
    assert (tmp_path / "cli.png").read_bytes()[:8] == PNG
    with pytest.raises(ConfigError, match=r"plot: unknown metric 'm77' in .* \(valid: m0, m1, m2, m3, m4, m5, m6, "
                                          r"m7, n_cell\)\. Perhaps you meant 'm7'\?"):
        plot_file(path, metrics="m1,m77")
    with pytest.raises(ConfigError, match=r"plot: 'hist' is a vector metric; a study figure draws scalar metrics only"):
        plot_file(path, metrics=["hist"])
    with pytest.raises(ConfigError, match=r"plot metrics: expected at least one metric name, e.g. 'I,R' \(got ' ,'\)"):
        plot_file(path, metrics=" ,")
    assert main(["plot", str(path), "--metrics", "n_cel"]) == 2
    assert "Perhaps you meant 'n_cell'?" in capsys.readouterr().err


def test_a_vector_metric_is_drawn_as_a_heat_map(tmp_path):
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentsim import plot
    from agentsim.io.hdf5 import TrajectoryWriter, read_trajectory

    path = tmp_path / "v.h5"
    edges = [-np.inf, 0.0, 1.0, np.inf]
    with TrajectoryWriter(path, model="toy", params={}, seed=0, steps=9) as w:
        for step in range(10):
            w.write_metrics(step, {"n": step, "ages": np.asarray([step, 10 - step, 3]),
                                   "mean_xy": np.asarray([0.5 * step, np.nan]), "x": step / 2},
                            edges={"ages": edges})
    figs = plot._trajectory_figures(str(path), plt, None)
    axes = [ax for ax in figs[0].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == [k for k in read_trajectory(path).metrics if k != "step"]
    ages = next(ax for ax in axes if ax.get_title() == "ages")
    assert ages.collections and [t.get_text() for t in ages.get_yticklabels()] == ["-inf", "0", "1", "inf"]
    mean_xy = next(ax for ax in axes if ax.get_title() == "mean_xy")
    assert mean_xy.get_ylabel() == "entry" and [t.get_text() for t in mean_xy.get_yticklabels()] == ["0", "1"]
    plt.close(figs[0])
    assert plot_file(path) == str(tmp_path / "v.png")
    png = (tmp_path / "v.png").read_bytes()
    assert png[:8] == PNG and len(png) > 15_000
    assert plot_file(path, tmp_path / "ages.png", metrics="ages") == str(tmp_path / "ages.png")


@pytest.mark.long
def test_drawing_a_file_keeps_the_backend_of_a_session_that_uses_pyplot(tmp_path):
    # a notebook's inline backend must survive plot_file, or its later figures stop showing
    code = ("import matplotlib; matplotlib.use('svg'); import matplotlib.pyplot as plt; import agentsim as asim; "
            "from agentsim.plot import plot_file; "
            f"asim.run('sir', agents=300, steps=3, out={str(tmp_path / 's.h5')!r}); "
            f"plot_file({str(tmp_path / 's.h5')!r}, {str(tmp_path / 's.png')!r}); print(matplotlib.get_backend())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "svg" and (tmp_path / "s.png").stat().st_size > 1000
