/* plan/plan_cmd.h - `tandem plan` (SPEC section 14, docs/planning.md). */
#ifndef TANDEM_PLAN_PLAN_CMD_H
#define TANDEM_PLAN_PLAN_CMD_H

int cmd_plan(int argc, char **argv);

#endif
