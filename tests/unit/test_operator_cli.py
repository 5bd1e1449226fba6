"""The operator's command line (python -m spmd_operator): flags parsed, bad values refused naming the flag."""

from __future__ import annotations

import pytest

from spmd_operator import __main__ as cli


def test_the_network_policy_flags_are_parsed_and_a_bad_label_is_refused_naming_the_flag(capsys):
    args = cli.parse_args(["-A", "--network-policy", "--operator-pod-labels",
                           "app.kubernetes.io/name=monarch-spmd, app.kubernetes.io/instance=spmd"])
    assert args.network_policy is True
    assert args.operator_labels == {"app.kubernetes.io/name": "monarch-spmd", "app.kubernetes.io/instance": "spmd"}
    assert cli.parse_args(["-A"]).network_policy is False
    with pytest.raises(SystemExit):
        cli.parse_args(["-A", "--network-policy", "--operator-pod-labels", "monarch-spmd"])
    assert "--operator-pod-labels: 'monarch-spmd' is not KEY=VALUE" in capsys.readouterr().err
