"""hvdtrain.models.registry: every registered model builds and outputs [batch, num_classes]
logits; user models given as package.module:function; every user mistake is a UserError."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.models import registry
from hvdtrain.config import ModelConfig
from hvdtrain.errors import UserError


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


# Every registered model at least once (test_every_registered_model_is_covered holds it).
CASES = [
    ("mlp", (64,), 10),
    ("mlp", (8, 8, 1), 3),           # mlp takes any shape
    ("cnn", (8, 8, 1), 10),
    ("cnn", (28, 28, 3), 4),
    ("resnet_small", (32, 32, 3), 10),
    ("mobilenetv2", (32, 32, 3), 7),
    ("resnet50", (32, 32, 3), 10),
    ("embedding", (8, 8, 1), 10),
]


@pytest.mark.parametrize("name, input_shape, num_classes", CASES)
def test_registered_models_output_logits(name, input_shape, num_classes):
    assert name in registry.REGISTRY
    model = registry.build(ModelConfig(name=name, width=16), input_shape, num_classes)
    _assert_logits(model, input_shape, num_classes)


def uncovered(cases: list, registry: dict) -> set[str]:
    return set(registry) - {name for name, *_ in cases}


def test_every_registered_model_is_covered():
    # Held to the registry itself, not to a copy of its names: a model added to the registry
    # without a case here fails.
    assert uncovered(CASES, registry.REGISTRY) == set()
    # Control: a case dropped, or a model registered with no case, is caught.
    assert uncovered([c for c in CASES if c[0] != "resnet50"], registry.REGISTRY) == {"resnet50"}
    assert uncovered(CASES, {**registry.REGISTRY, "vit": None}) == {"vit"}


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


@pytest.mark.parametrize("name, input_shape", [
    ("cnn", (64,)),                   # 1-D input: not an image
    ("cnn", (4, 4, 1)),               # sides below 8
    ("resnet_small", (64,)),
    ("mobilenetv2", (8, 8, 1)),       # Keras would raise a raw ValueError
    ("resnet50", (16, 16, 3)),
    ("resnet50", (32, 32)),
])
def test_model_refuses_an_input_shape_with_a_user_error(name, input_shape):
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
