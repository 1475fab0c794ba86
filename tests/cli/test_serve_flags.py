"""`specfleet serve`'s flags: one for every field of the service config, each over the YAML's value,
each with help; a user's mistake is one line naming the flag and exit status 2."""
import argparse

import pytest
from pydantic import BaseModel

from deploy.cli import build_parser, main
from deploy.config import ServiceConfig
from deploy.serve_flags import COMPOSITE_FLAGS, SERVE_FLAGS, apply_flags
from deploy.service.app import DEFAULT_CONFIG, load_serve_config


def leaf_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every settable field of a config model, nested models walked (lists of models are one field)."""
    leaves = []
    for name, info in model.model_fields.items():
        if info.exclude:  # api_keys: only there to refuse keys written into the config
            continue
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            leaves += leaf_fields(kind, prefix + (name,))
        else:
            leaves.append(prefix + (name,))
    return leaves


def serve_args(*flags: str) -> dict:
    return apply_flags(load_serve_config(DEFAULT_CONFIG)[0], build_parser().parse_args(["serve", *flags]))


def test_every_config_field_has_a_flag():
    reachable = {path for path, _, _ in SERVE_FLAGS.values()} | set(COMPOSITE_FLAGS)
    assert set(leaf_fields(ServiceConfig)) <= reachable


def test_flags_override_the_yaml_and_leave_the_rest_as_it_is():
    yaml_args = load_serve_config(DEFAULT_CONFIG)[0]
    args = serve_args("my-model-dir", "--policy", "thompson", "--verify", "tree", "--top-p", "0.9",
                      "--served-model-name", "smol", "--target-resources", '{"specfleet_target": 1}')
    assert args["target"] == yaml_args["target"] | {"model": "my-model-dir", "resources": {"specfleet_target": 1}}
    assert (args["policy"], args["verify"], args["served_model_name"]) == ("thompson", "tree", "smol")
    assert args["sampling"] == yaml_args["sampling"] | {"top_p": 0.9}
    assert args["drafters"] == yaml_args["drafters"] and args["k"] == yaml_args["k"]
    assert serve_args() == yaml_args


def test_drafters_take_kinds_names_and_the_full_json_form():
    args = serve_args("--drafters", "ngram,fast=suffix,hf", "--draft-model", "smollm2-135m", "--draft-layers", "2")
    assert args["drafters"] == [{"name": "ngram", "kind": "ngram"}, {"name": "fast", "kind": "suffix"},
                                {"name": "hf", "kind": "hf", "model": "smollm2-135m", "num_layers": 2}]
    full = serve_args("--drafters", '[{"name": "ngram", "kind": "ngram", "num_gpus": 0.5}]')
    assert ServiceConfig.model_validate(full).drafters[0].num_gpus == 0.5


def test_every_flag_of_every_command_explains_itself():
    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    for parser in parsers(build_parser()):
        for action in parser._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--k", "0"], "--k"),
        (["--top-p", "2"], "--top-p"),
        (["--policy", "nope"], "--policy"),
        (["--drafters", "ngram", "--policy", "fixed:suffix"], "--policy"),
        (["--drafters", "ngram,telepathy"], "--drafters"),
        (["--drafters", "ensemble=ngram"], "--drafters"),  # the ensemble mode's draft is named so
        (["--verify", "sideways"], "--verify"),
        (["--draft-model", "smollm2-135m"], "--draft-model"),
        (["--target-resources", "{not json"], "--target-resources"),
        (["--target-replicas", "0"], "--target-replicas"),
        (["--target-autoscaling", '{"min_replicas": 3, "max_replicas": 2}'], "--target-autoscaling"),
        (["--target-autoscaling", '{"max_replicas": 2}', "--target-replicas", "2"], "--target"),
        (["--port", "eighty"], "--port"),
        (["--config", "/nonexistent/serve.yaml"], "--config"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_and_exit_status_2(flags, named, capsys):
    try:
        status = main(["serve", *flags])  # fails before Ray starts
    except SystemExit as exit_:  # argparse's own errors exit from parse_args
        status = exit_.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and named in err


@pytest.mark.parametrize("flag", ["--port", "--grpc-port"])
def test_a_port_in_use_is_refused_before_anything_starts(flag, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", flag, str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {flag}: 127.0.0.1:") and "is in use" in err


def test_the_admin_commands_find_the_service_at_specfleet_url(monkeypatch, capsys):
    from tests.conftest import free_ports

    url = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    monkeypatch.setenv("SPECFLEET_URL", url)
    assert main(["drafters", "list"]) == 1
    assert f"cannot reach the service at {url}" in capsys.readouterr().err


def test_print_config_writes_the_serve_config_the_flags_make_for_serve_deploy(capsys):
    import yaml

    assert main(["serve", "--policy", "thompson", "--api-key-file", "~/.specfleet/api_keys", "--port", "8100",
                 "--print-config"]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    app = next(a for a in document["applications"] if a["name"] == "specfleet")
    assert app["args"] == serve_args("--policy", "thompson", "--api-key-file", "~/.specfleet/api_keys")
    assert app["import_path"] == "deploy.service.app:build_app" and document["http_options"]["port"] == 8100
    assert main(["serve", "--top-p", "3", "--print-config"]) == 2
    assert "--top-p" in capsys.readouterr().err
