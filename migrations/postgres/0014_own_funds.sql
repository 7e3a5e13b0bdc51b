-- Operators may mark money in suspense as the merchant's own (a gas top-up sent before a
-- sweep).
ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_check
    CHECK (action IN ('accept_as_paid', 'credit_balance', 'mark_refunded', 'mark_own_funds', 'dismiss'));
