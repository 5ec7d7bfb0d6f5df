# Sourced by scripts/shadow-cost.sh and scripts/shadow-time.sh, so both measure the same runs.
#
# `shadow_requests SCENARIO` prints the `traffic.requests` a measuring pass runs the scenario with
# (empty: the whole scenario). The long `-8b-` scenarios are cut so that a pass under callgrind
# takes minutes; the model scenarios (tensor parallel, mixture of experts, large models) to 100.
shadow_requests() {
    case $1 in
    chat-8b-h200) echo 500 ;;
    conversation-tiered-8b-h200) echo "" ;;
    *-8b-* | *-8b) echo 300 ;;
    deepseek-* | gemma3-* | gpt-oss-* | llama3-70b-* | mixtral-*) echo 100 ;;
    *) echo "" ;;
    esac
}

# `shadow_scenarios` prints every shipped scenario's name, one a line.
shadow_scenarios() {
    local f
    for f in scenarios/*.toml; do
        basename "$f" .toml
    done
}
