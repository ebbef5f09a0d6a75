;;; magent-store-print.el --- Printing messages the way the EPC peer reads them  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; The backend reads what `prin1' prints, except that `prin1' writes
;; bytes (of unibyte strings, or raw bytes in multibyte ones) as octal
;; escapes the backend would take literally.  The functions here print
;; at point and turn such escapes back into the text they encode.  A
;; batch the core queued prints itself from its vector, one entry after
;; another (`magent-store-print-batch').

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)

(defun magent-store-print (sexp)
  "Print SEXP at point, the way the EPC peer expects it.
Strings holding bytes (unibyte ones, or raw bytes in multibyte ones)
are the only ones `prin1' writes with octal escapes, which the backend
would take literally: such bytes are turned back into the UTF-8 text
they encode, and bytes that are not UTF-8 into U+FFFD.  Text that has
no bytes costs one search."
  (let ((print-escape-newlines nil)
        (print-escape-nonascii nil)
        (print-escape-multibyte nil)
        (print-escape-control-characters nil)
        (print-length nil)
        (print-level nil)
        (start (point)))
    (prin1 sexp (current-buffer))
    (magent-store-print--unescape-bytes start)))

(defun magent-store-print--unescape-bytes (start)
  "Turn the octal escapes `prin1' wrote after START back into text.
Point stays where it is (at the end of what was printed)."
  (let ((case-fold-search nil)
        ;; Positions, not `save-excursion': no marker per message.
        (after (- (point-max) (point))))
    (goto-char start)
    (while (re-search-forward "\\\\[0-7]" nil t)
      (let ((escape (- (point) 2)))
        (goto-char escape)
        (skip-chars-backward "\\\\")
        ;; After an odd number of backslashes the digit is text.
        (if (cl-evenp (- escape (point)))
            (magent-store-print--decode-octal escape)
          (goto-char (+ escape 2)))))
    (goto-char (- (point-max) after))))

(defun magent-store-print--decode-octal (start)
  "Replace the run of octal escapes at START by the text its bytes encode."
  (goto-char start)
  (looking-at "\\(?:\\\\[0-7][0-7]?[0-7]?\\)+")
  (let* ((end (match-end 0))
         ;; The reader makes the bytes of the run at C speed.
         (bytes (car (read-from-string
                      (concat "\"" (buffer-substring-no-properties start end)
                              "\""))))
         (text (decode-coding-string bytes 'utf-8-unix)))
    (delete-region start end)
    (insert (if (string-match-p "[\200-\377]" text) ; bytes that were not UTF-8
                (apply #'string
                       (mapcar (lambda (char)
                                 (if (eq (char-charset char) 'eight-bit)
                                     #xfffd
                                   char))
                               text))
              text))))

(defsubst magent-store-print--string (string)
  "Print STRING at point, without its text properties."
  (prin1 (if (or (text-properties-at 0 string)
                 (next-property-change 0 string))
             (substring-no-properties string)
           string)
         (current-buffer)))

;;;; A batch

(defconst magent-store-entry-slots 4
  "Slots an entry takes in a batch vector.
A chunk is ITEM-ID CHUNK OUTPUT-P TIME (TIME in seconds, a float); an
event is its JSON TEXT, then nil in the other three.")

(defun magent-store-print-batch (batch fill)
  "Print the entries of BATCH's first FILL slots at point, as one list.
Bytes in strings are turned into text as by `magent-store-print'."
  ;; t: print strings as they are; the default copies each one first.
  (let ((print-charset-text-property t)
        (print-escape-newlines nil)
        (print-escape-nonascii nil)
        (print-escape-multibyte nil)
        (print-escape-control-characters nil)
        (buffer (current-buffer))
        (start (point))
        (i 0))
    (insert "(")
    (while (< i fill)
      (let ((chunk (aref batch (1+ i))))
        (if (not chunk)
            (magent-store-print--string (aref batch i))
          (insert "(")
          (magent-store-print--string (aref batch i))
          (insert " ")
          (magent-store-print--string chunk)
          (insert (if (aref batch (+ i 2)) " t " " nil "))
          (prin1 (aref batch (+ i 3)) buffer)
          (insert ")")))
      (insert " ")
      (setq i (+ i magent-store-entry-slots)))
    (insert ")")
    (magent-store-print--unescape-bytes start)))

(defun magent-store-print-flush-args (args)
  "Print ARGS, (SESSION-ID NUMBERED . EXTRA), as a flush's arguments at point.
NUMBERED is a batch with its number, (NUMBER BATCH FILL LARGE)."
  (let ((buffer (current-buffer))
        (numbered (nth 1 args)))
    (insert "(")
    (prin1 (car args) buffer)
    (insert " ")
    (magent-store-print-batch (nth 1 numbered) (nth 2 numbered))
    (dolist (arg (nthcdr 2 args))
      (insert " ")
      (magent-store-print arg))
    (insert ")")))

(provide 'magent-store-print)
;;; magent-store-print.el ends here
