"""What the playbook runner says about a failed task: the line a lab run or a test shows first."""

from inferhost.runner import failure_text


def test_a_failed_loop_names_its_first_failed_item_and_that_items_error():
    res = {
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "_ansible_item_label": "torch", "stderr": ""},
            {
                "failed": True,
                "_ansible_item_label": "env: engine",
                "msg": "non-zero return code",
                "stderr": "Resolved 120 packages\nerror: No space left on device (os error 28)",
            },
        ],
    }
    text = failure_text(res)
    assert text.startswith("item env: engine: non-zero return code")
    assert "No space left on device" in text


def test_a_command_keeps_only_the_last_lines_of_its_output():
    text = failure_text({"msg": "non-zero return code", "stderr": "\n".join(f"line {n}" for n in range(40))})
    assert "line 39" in text
    assert "line 24" not in text


def test_a_task_with_no_message_says_failed():
    assert failure_text({}) == "failed"
