"""hvdtrain.models.registry: every registered model builds and outputs [batch, num_classes]
logits at the smallest input its catalog row admits, and refuses a smaller one; the registry, the
config's help, docs/configuration.md and the benchmarks' workloads name the catalog's models;
user models given as package.module:function; every user mistake is a UserError."""
from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from helpers import ROOT
from hvdtrain.models import registry
from hvdtrain.config import ModelConfig, model_catalog, overrides, presets
from hvdtrain.errors import UserError
from hvdtrain.bench.shared import workloads


def _forward(model: tf.keras.Model, input_shape, batch: int = 2) -> np.ndarray:
    x = np.random.default_rng(0).random((batch, *input_shape), dtype=np.float32)
    return model(x, training=False).numpy()


def _assert_logits(model: tf.keras.Model, input_shape, num_classes: int) -> None:
    assert model.input_shape == (None, *input_shape)
    assert model.output_shape == (None, num_classes)
    out = _forward(model, input_shape)
    assert out.shape == (2, num_classes)
    assert np.isfinite(out).all()
    # Logits, not probabilities: the last layer has no softmax (nor any other activation).
    assert model.layers[-1].activation is tf.keras.activations.linear
    assert not np.allclose(out.sum(axis=1), 1.0)
    assert np.ptp(out) > 0                                     # not a constant output


def smallest_inputs(row: model_catalog.Model) -> list[tuple[int, ...]]:
    """The smallest inputs the catalog's row admits: images at its least side, or, for a
    model that takes any shape, a vector and a small grey image."""
    return [(row.min_side, row.min_side, 3)] if row.min_side else [(64,), (8, 8, 1)]


def too_small_inputs(row: model_catalog.Model) -> list[tuple[int, ...]]:
    """What an image model's row refuses: a vector, a side one short, no channel axis."""
    side = row.min_side
    return [(64,), (side - 1, side - 1, 3), (side, side)] if side else []


# Every registered model, from the catalog itself (a model added there is built here), at the
# smallest input its row admits; then larger inputs and other class counts.
CASES = [(row.name, shape, 10) for row in model_catalog.MODELS for shape in smallest_inputs(row)]
CASES += [("mlp", (8, 8, 1), 3), ("cnn", (28, 28, 3), 4), ("resnet_small", (32, 32, 3), 10),
          ("mobilenetv2", (32, 32, 3), 7)]
REFUSED = [(row.name, shape) for row in model_catalog.MODELS for shape in too_small_inputs(row)]


@pytest.mark.parametrize("name, input_shape, num_classes", CASES)
def test_registered_models_output_logits(name, input_shape, num_classes):
    model = registry.build(ModelConfig(name=name, width=16), input_shape, num_classes)
    _assert_logits(model, input_shape, num_classes)


def test_the_registry_builds_the_catalogs_models_with_their_own_builders():
    assert list(registry.REGISTRY) == model_catalog.names()
    assert all(registry.REGISTRY[name].__name__ == name for name in model_catalog.names())
    assert {"mlp", "cnn", "resnet50"} <= set(registry.REGISTRY)
    assert len(CASES) >= 12 and len(REFUSED) >= 12       # the catalog's cases, not none
    # What the registry's import asserts: every row has its builder and every builder a row.
    assert registry.unmatched(model_catalog.names(), registry.REGISTRY) == []
    # Control: a row without a builder, or a builder without a row, is named.
    assert registry.unmatched([*model_catalog.names(), "vit"], registry.REGISTRY) == ["vit"]
    without = [name for name in model_catalog.names() if name != "resnet50"]
    assert registry.unmatched(without, registry.REGISTRY) == ["resnet50"]


# ---------------------------------------------------------------------------------------------
# The other lists of models: the config's help, docs/configuration.md, the benchmarks' workloads

def readme_models(readme: str) -> list[str]:
    """The names in docs/configuration.md's **Models** paragraph, before its "Your own" (a user
    model)."""
    paragraph = readme.split("**Models** (`model.name`):", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"`(\w+)`", paragraph.split("Your own", 1)[0])


def unlisted(text: str, names: list[str]) -> list[str]:
    """The ``names`` that ``text`` does not name as a word."""
    return [n for n in names if not re.search(rf"\b{re.escape(n)}\b", text)]


def test_the_configuration_doc_lists_the_registered_models():
    listed = readme_models((ROOT / "docs" / "configuration.md").read_text())
    assert sorted(listed) == sorted(model_catalog.names()), listed
    # Control: a page that leaves models out differs (its user model is not counted).
    left_out = "**Models** (`model.name`): `mlp`, `cnn` (images).\nYour own: `a.b:c`.\n\n"
    assert readme_models(left_out) == ["mlp", "cnn"]
    assert sorted(readme_models(left_out)) != sorted(model_catalog.names())


def test_the_config_help_lists_every_registered_model():
    text = overrides.describe()
    help_line = text.split("model.name (", 1)[1].split("\n")[1]
    assert unlisted(help_line, model_catalog.names()) == []
    # Control: a help line without a model names it.
    assert unlisted(help_line.replace("embedding, ", ""), model_catalog.names()) == ["embedding"]


def wrong_workloads(table: dict[str, workloads.Workload]) -> list[str]:
    """The benchmarks' workloads not keyed by the registered model their preset trains."""
    return [key for key, work in table.items()
            if key not in model_catalog.names() or work.name != key
            or presets.build_config(work.preset).model.name != key]


def test_the_benchmarks_workloads_are_registered_models():
    assert wrong_workloads(workloads.WORKLOADS) == [] and len(workloads.WORKLOADS) >= 3
    assert workloads.model_names(None, quick=False) and workloads.model_names(None, quick=True)
    # Control: a model not registered, a workload whose preset trains another model, and one
    # keyed apart from its name.
    assert wrong_workloads({"vit": workloads.Workload("vit", "synthetic-mlp", 8, (8, 8, 1)),
                            "cnn": workloads.Workload("cnn", "synthetic-mlp", 8, (8, 8, 1)),
                            "resnet50": workloads.WORKLOADS["mlp"]}) == ["vit", "cnn", "resnet50"]


def test_embedding_model_has_sparse_gradients_on_its_table():
    # What horovod.sparse_as_dense is for: the table's gradient holds only the rows looked up.
    model = registry.build(ModelConfig(name="embedding", width=32), (8, 8, 1), 10)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    table = next(v for v in model.trainable_variables if "embedding" in v.name)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    assert table.shape[0] == 64 * 16 and grad.indices.shape[0] == 4 * 64  # 64 tokens a sample


def test_mlp_width_and_dropout_follow_the_config():
    model = registry.build(ModelConfig(name="mlp", width=16), (64,), 10)
    dense = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Dense)]
    assert [layer.units for layer in dense] == [32, 16, 10]
    assert model.count_params() == (64 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10)
    assert not any(isinstance(layer, tf.keras.layers.Dropout) for layer in model.layers)
    with_dropout = registry.build(ModelConfig(name="mlp", width=16, dropout=0.5), (64,), 10)
    drops = [layer for layer in with_dropout.layers if isinstance(layer, tf.keras.layers.Dropout)]
    assert len(drops) == 1 and drops[0].rate == 0.5


@pytest.mark.parametrize("name, input_shape", REFUSED)
def test_model_refuses_an_input_shape_with_a_user_error(name, input_shape):
    # Below the row's least side, Keras's applications would raise a raw ValueError and the
    # small CNNs would build: the row's check comes first.
    with pytest.raises(UserError) as info:
        registry.build(ModelConfig(name=name), input_shape, 10)
    message = str(info.value)
    assert name in message and str(input_shape) in message
    assert "mlp takes any shape" in message                  # says what to do instead


def test_unknown_model_suggests_the_closest_name():
    with pytest.raises(UserError) as info:
        registry.build(ModelConfig(name="cnnn"), (8, 8, 1), 10)
    message = str(info.value)
    assert "unknown model 'cnnn'" in message
    assert "did you mean 'cnn'?" in message
    assert "package.module:function" in message
    with pytest.raises(UserError, match="did you mean 'resnet50'"):
        registry.resolve("resnet5")
    with pytest.raises(UserError) as far:
        registry.resolve("transformer")
    assert "did you mean" not in str(far.value) and "mlp, cnn" in str(far.value)


# ---------------------------------------------------------------------------------------------
# User models: package.module:function(input_shape, num_classes)

PACKAGE = "hvdtrain_test_usermodels"

USER_MODULE = textwrap.dedent('''
    import tensorflow as tf

    CALLS = []

    def tiny(input_shape, num_classes):
        CALLS.append((tuple(input_shape), num_classes))
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Flatten()(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x), name="tiny")

    def not_a_model(input_shape, num_classes):
        return "a string"

    def layer_not_model(input_shape, num_classes):
        return tf.keras.layers.Dense(num_classes)

    def too_few_classes(input_shape, num_classes):
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Flatten()(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes - 1)(x))

    def two_outputs(input_shape, num_classes):
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Flatten()(inputs)
        return tf.keras.Model(inputs, [tf.keras.layers.Dense(num_classes)(x),
                                       tf.keras.layers.Dense(num_classes)(x)])

    def forgot_flatten(input_shape, num_classes):
        # Dense on an image acts per pixel: [batch, h, w, num_classes], not [batch, classes].
        inputs = tf.keras.Input(input_shape)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(inputs))

    def unbuilt_sequential(input_shape, num_classes):
        # No Input layer: Keras does not know the model's shapes until it is called.
        return tf.keras.Sequential([tf.keras.layers.Flatten(),
                                    tf.keras.layers.Dense(num_classes)])

    def wrong_signature():
        return None

    not_callable = 42
''')


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A package ``PACKAGE`` with module ``nets`` on sys.path, fresh for every test."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(USER_MODULE)

    def forget():
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]
    forget()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{PACKAGE}.nets"
    forget()


def test_user_model_builds(user_package):
    model = registry.build(ModelConfig(name=f"{user_package}:tiny"), (6, 5), 7)
    assert model.name == "tiny"
    _assert_logits(model, (6, 5), 7)
    assert sys.modules[user_package].CALLS == [((6, 5), 7)]   # got the shape and class count


@pytest.mark.parametrize("function, phrase", [
    ("not_a_model", "returned str, not a tf.keras.Model"),
    ("layer_not_model", "returned Dense, not a tf.keras.Model"),
    ("too_few_classes", "must output [batch, 7] logits"),
    ("two_outputs", "must output [batch, 7] logits"),
    ("wrong_signature", "cannot be built"),
    ("missing_function", "has no function 'missing_function'"),
    ("not_callable", "has no function 'not_callable'"),
])
def test_user_model_mistakes_are_user_errors(user_package, function, phrase):
    name = f"{user_package}:{function}"
    with pytest.raises(UserError) as info:
        registry.build(ModelConfig(name=name), (6, 5), 7)
    assert phrase in str(info.value)
    assert name in str(info.value)                            # names the model it refers to


def test_user_model_output_must_be_batch_by_classes(user_package):
    # Last axis right, but [batch, 6, 7] is not one logit vector per sample.
    with pytest.raises(UserError, match=r"must output \[batch, 7\] logits"):
        registry.build(ModelConfig(name=f"{user_package}:forgot_flatten"), (6, 5), 7)


def test_user_model_without_known_shapes_is_a_user_error(user_package):
    # A Sequential without an Input layer has no output shape yet: that must be reported as a
    # UserError, not an AttributeError from Keras.
    with pytest.raises(UserError):
        registry.build(ModelConfig(name=f"{user_package}:unbuilt_sequential"), (6, 5), 7)


def test_user_model_module_missing(user_package):
    name = f"{PACKAGE}.no_such_module:tiny"
    with pytest.raises(UserError) as info:
        registry.build(ModelConfig(name=name), (6, 5), 7)
    message = str(info.value)
    assert f"cannot import '{PACKAGE}.no_such_module'" in message and "PYTHONPATH" in message
    with pytest.raises(UserError,
                       match="cannot import 'no_such_top_level_pkg.nets'.*No module named"):
        registry.resolve("no_such_top_level_pkg.nets:tiny")


@pytest.mark.parametrize("name", [":tiny", ".nets:tiny"])
def test_malformed_user_model_names_are_user_errors(name):
    # An empty or relative module name: importlib raises ValueError / TypeError for these.
    with pytest.raises(UserError):
        registry.resolve(name)
