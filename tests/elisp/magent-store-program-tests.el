;;; magent-store-program-tests.el --- ERT: the backend's command line, run in the background  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-program-run' runs the backend's command line (the
;; history tools: search, scan, the finder's listing) and hands its
;; output to a callback: what it leaves behind once the command is done.

;;; Code:

(require 'ert)
(require 'magent-store-test-backend)
(require 'magent-store-program)

(ert-deftest magent-store-program-run-leaves-no-buffer-behind ()
  "A command run in the background hands its output over, then its buffer goes.
Every search, scan and listing runs one: a buffer left each time would
pile up in the user's buffer list."
  (let* ((magent-store-python (or magent-store-test-python magent-store-python))
         (name (format "magent-store-program-test-%d" (random 1000000)))
         (done nil)
         (process (magent-store-program-run
                   name '("--version")
                   (lambda (_process output status)
                     (setq done (list output status))))))
    (while (not done)
      (accept-process-output process 1))
    (should (equal (cadr done) 0))
    (should (string-prefix-p "magent-store " (car done)))
    (should-not (get-buffer (format " *%s*" name)))))

(provide 'magent-store-program-tests)
;;; magent-store-program-tests.el ends here
